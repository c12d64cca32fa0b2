"""The report (experiments.report): runs read and pooled over seeds (results), column labels
(labels), a run against its task's paper setup (paper_setup), the tables and their marks (tables),
the mixed datasets' table in the paper's appendix layout (mixed), learning curves (curves), the
files written (writer), the protocol versions it reads (protocols), interval estimates across
tasks (aggregates: rliable, the optional `report` extra) and the paper's numbers
(paper_results)."""
