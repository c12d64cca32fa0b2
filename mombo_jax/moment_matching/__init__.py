"""The moment-matching library, pure JAX, below the training program (core/ imports it, never the
reverse): a Gaussian's moments pushed through a network in closed form. The primitives behind
MOMBO's critic (moments: mm_relu, mm_linear, mm_leaky_relu) and their Monte Carlo reference
(monte_carlo); `propagate`, which lifts any JAX function onto moments (propagate: the entry point
and the diagonal mode's rules; interpreter: the jaxpr interpreter both modes share; full: the
full-covariance mode, its ReLU covariance in relu_covariance; closed_forms: a value combined with
itself, x * x, x ** n, exp; door: the inputs' checks; where: the user's line a refusal names); and
the paper's W1 bounds (bounds: the Lemma per ReLU and per network, and both theorems' PEVI
bounds; mlp_trace: the ReLU MLP read from a network as it runs, for the bound); and lowrank: a
Gaussian input of low-rank covariance carried through a ReLU MLP with its correlations (the
`--moments=lowrank` mode of MOMBO's targets)."""
