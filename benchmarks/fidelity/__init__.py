"""The fidelity harness (issue #48): the released reference's own update stepped beside ours from
the same weights, batches and random draws, every intermediate compared
(`python3 -m benchmarks.fidelity --algo=mombo|mobile|mopo --reference=DIR`; README.md).

Modules: __main__.py (the CLI), rows.py (the row format and the table), reference.py (checking
DIR's commit, importing its code with the named stubs), ours.py (our side, no torch: the setup,
the draws our keys make, our update driven by them), stubs.py (what the harness puts around their
code: our draws for theirs, the float64 casts, the recorders), theirs_base.py (what both
references' sides share: their dynamics model with our weights, the batch, one recorded learn()),
theirs_mombo.py (adinlab/MOMBO's MOMBOPolicy), theirs_kit.py (OfflineRL-Kit's MOBILEPolicy and
MOPOPolicy), agent_side.py (the agent comparison over K steps), dynamics_side.py (the dynamics
and rollout comparisons), dyn_ours.py (its side of ours, no torch: the data, the draws our keys
make for the ensemble's epoch and the rollout), dyn_theirs.py (its side of theirs: their
ensemble, scaler, termination functions and rollout fed our draws).
"""
