"""Faults a production deployment meets: silent partitions, full disks, lost source positions."""
