"""Reports of evaluation runs: tables in any format (`bart_opt.report.tables`) and ``bart-opt report``."""
