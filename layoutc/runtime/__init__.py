"""What every generated converter carries: size solving, run-time checks, the guard's stamps."""
