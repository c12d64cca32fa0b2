"""Making datasets: the writer, recipes, recording, online SAC, actors, cards, D4RL."""
