"""What a run writes as it trains: checkpoints, metrics.jsonl, TensorBoard events, snapshots, and the progress it prints (logger)."""
