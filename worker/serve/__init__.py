"""Serving jobs on one worker: the loop, job intake, publishing events, the heartbeat and cancels."""
