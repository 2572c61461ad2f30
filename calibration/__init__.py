"""Microbenchmarks (torch, optional extra ``calibrate``) that fit the hardware profiles'
efficiency curves, and validation of the cost model against measurements.

Empty until the calibration issue lands. Only this package may import torch; the simulator core
never does (a test checks it).
"""
