"""Request workloads: trace readers and synthetic arrival/length generators.

Empty until the engine issue (foundation part 2) lands its generators (Poisson, Gamma, constant
rate; fixed, uniform, lognormal or trace-resampled lengths) and trace readers (plain CSV, Azure
2023, Mooncake, BurstGPT, ShareGPT/arXiv length stats). The cost model does not depend on it.
"""
