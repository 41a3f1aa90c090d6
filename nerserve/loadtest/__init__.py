"""nerserve load tester: speaks HTTP only and imports nothing from the project.

Reproduces the seed papers' efficiency protocols through POST /extract (NAG-NER: a fixed batch of
4 sentences; SetGNER: the test set in batches filled to 800 source tokens, fixed order; GNER:
batches of 4) and loads the service closed-loop (concurrency sweep) and open-loop (scheduled
Poisson/constant arrivals, latency measured from the scheduled time: no coordinated omission).
Those loads send the split shuffled by default (seeded, the same order every run; `--order file`
keeps the file's order): a run over a duration sends a prefix of it, and only a shuffled prefix is
a sample of the split (`client.arrange`).
"""
