"""Analyses: combine the domain parts (probes, calibration, stats) into the runs of one shard job."""
