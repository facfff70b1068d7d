"""What a config names a strategy by (``strategy.config_name``, the name ``strategy=auto`` writes back)."""

from processor.strategies import BUILT_IN, ShardSequence


class MyStrategy(ShardSequence):
    """A strategy of one's own, built on a built-in."""


def test_a_built_in_is_named_by_its_name_and_ones_own_by_its_import_path():
    for name, cls in BUILT_IN.items():
        assert cls().config_name == name
    assert MyStrategy().config_name == f"{__name__}:MyStrategy"
