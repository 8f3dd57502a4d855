"""The truth fuzzer: random lab incidents whose answer is known, bisected through the real
CLI and compared with an oracle written apart from the search (see docs/fuzz.md).

`incident.py` holds an incident and writes its files, `generate.py` draws one from a seed,
`oracle.py` works out its expected answer from the scenario and the two configs alone,
`judge.py` compares the CLI's answer with it, `runner.py` runs it on a lab host,
`shrink.py` makes a wrong answer small and `cases.py` keeps it as a regression case.
"""
