"""One federated run on Ray: `engine.run_federated` and what it places, starts and calls (see `fedvlp.platform`)."""
