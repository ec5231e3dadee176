"""Checks of the CLI's answers that several test files make."""

from __future__ import annotations

from flows.cli import main as cli_main

#: what ``run`` prints, alone, when it is interrupted (SIGINT, SIGTERM)
INTERRUPTED_LINE = (
    "embed-sweep: interrupted; finished grid points are kept in the store, run the same command "
    "again to resume"
)


def refused(argv, capsys, *words) -> str:
    """The command is refused: exit 2 and one line on stderr holding every one of ``words``."""
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err
