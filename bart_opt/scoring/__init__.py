"""Metrics behind one interface (`bart_opt.scoring.base.Metric`): ROUGE, length, extractive
fragments, BERTScore and factual consistency, each with per-example scores, the shared bootstrap
interval and a recorded signature."""
