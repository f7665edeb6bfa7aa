"""Failover: job ownership by epochs, taking over dead or stalled workers' jobs, resuming from the journal."""
