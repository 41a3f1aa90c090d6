"""Architectures: each lives in its own folder behind the same contract
(config · network · graphs · program · decode), see docs/design notes in README."""
