"""Replays of recorded scheduler logs through the daemon's gRPC interface."""
