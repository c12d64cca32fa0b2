"""Trained runs looked into: a run read back (trained), a seed as a `Policy` (policy) and its
videos (render), Figure 1, moment matching against Monte Carlo (mm_vs_mc), Table 2, the
uncertainty quantifiers' quality (quantifier_quality) over many runs (uncertainty_runs), the
paper's suboptimality theorems on a run's critic (pevi_bounds) and `propagate`'s moments of a
critic against Monte Carlo (critic_moments)."""
