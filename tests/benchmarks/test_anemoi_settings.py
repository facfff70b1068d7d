"""The per-setting cost benchmark runs every variant and reports each against the plain one."""

from benchmarks.anemoi_settings import VARIANTS, main


def test_every_setting_is_timed_against_the_plain_processor(capsys):
    main(["--points", "96", "--channels", "16", "--heads", "2", "--window", "5", "--layers", "1", "--rounds", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "ms" not in line]
    assert [row.split(" | ")[0][2:] for row in rows] == list(VARIANTS)
    assert rows[0].endswith("| 1.00 |")
    assert all(float(row.split(" | ")[1]) >= 0 for row in rows)
