"""``python -m training.parity``: the configured strategy and ranks against a reference layout
(one rank by default), step by step: the loss, every gradient and every parameter after the
optimiser step. See :mod:`training.parity.__main__`."""
