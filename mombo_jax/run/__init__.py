"""A training launch: what it trains (run_specs), its launch object (launch: plan, prepare,
train, finish), each run on the host (host_run) and where it resumes (resume), the device program
(program), checks, loggers, several processes, sweeps."""
