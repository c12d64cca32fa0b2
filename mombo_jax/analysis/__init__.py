"""Trained runs looked into: runs, policies, videos, Figure 1 (MM vs MC), Table 2."""
