"""What every attack shares: the protocol and registry, the run loop, checkpoints, the record, memory, priors, score."""
