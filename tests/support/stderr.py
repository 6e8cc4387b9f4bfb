"""Reading a command's stderr as problems: each fits 80 columns (infra.usage.fit), and a long
one continues on lines indented two spaces."""

from __future__ import annotations

from infra.usage import CONTINUED, ERROR_WIDTH


def problems(stderr: str) -> list[str]:
    """The problems in ``stderr``, each joined back into one line, after checking that no
    line is wider than ERROR_WIDTH (an assertion naming the first that is), but for one
    word that is wider alone (a long path, kept whole so it can be copied)."""
    out: list[str] = []
    for line in stderr.splitlines():
        word = line.removeprefix(CONTINUED).split(" ")
        assert len(line) <= ERROR_WIDTH or len(word) == 1, f"{len(line)} columns: {line}"
        if line.startswith(CONTINUED) and out:
            out[-1] += " " + line[len(CONTINUED) :]
        else:
            out.append(line)
    return out
