"""Interoperability with the systems our users come from (anemoi-models, anemoi-datasets).

Nothing here imports those packages: the converters only map tensors and settings.
"""
