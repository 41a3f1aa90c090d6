"""Training: loop, schedule, checkpoints, model selection on dev F1."""
