"""Q&D (questioner and drafter): need graphs, transcript metrics, the questioner-drafter loop."""
