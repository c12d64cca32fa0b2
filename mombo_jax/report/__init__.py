"""The report (experiments.report): runs read and pooled over seeds (results), column labels
(labels), a run against its task's paper setup (paper_setup), the tables and their marks (tables),
the mixed datasets' table in the paper's appendix layout (mixed), learning curves (curves), the
report's driver that finds the runs and writes the files (writer), their renderings as report.md
(markdown), report.tex (latex) and report.csv (csv_out), the footnotes and blank table cell the
renderings share (footnotes), the protocol versions it reads (protocols), interval estimates
across tasks (aggregates: rliable, the optional `report` extra) and the paper's numbers
(paper_results)."""
