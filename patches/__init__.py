"""Runtime patches installed in the training child: DataLoader (spawn-safe loaders) and Conv2d."""
