"""The report: results pooled from runs, labels, tables, aggregates, the paper's."""
