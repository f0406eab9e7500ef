"""Many runs: space files (`spaces`), `fedvlp sweep` (`sweep`), `fedvlp tune` (`tune`), `fedvlp report`
(`report`)."""
