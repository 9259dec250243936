"""What a run writes for people: metrics.jsonl, TensorBoard, experiment trackers,
logging and the progress bar."""
