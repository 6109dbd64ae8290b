"""What every decomposition family shares: the input of the MTTKRP families, checkpoint files,
fingerprints, run control (convergence, entropy, bytes read), result stores, the CP result and the
checks that keep a run from ending silently wrong. Nothing here imports a family."""
