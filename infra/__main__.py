"""`pulumi up --stack <name>`: the whole program is infra.program; this file only starts it."""

from infra.program import run

run()
