"""Scheduling policies and routers over one shared token-budget core.

Empty until the engine issue (foundation part 2) lands the policy interface and the continuous
batching policy; static, chunked-prefill, SJF, priority and disaggregated follow in the policies
issue. The cost model does not depend on it.
"""
