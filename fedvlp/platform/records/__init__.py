"""What a run leaves behind: round checkpoints (`checkpoint`) and its MLflow run (`tracking`)."""
