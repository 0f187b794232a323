"""Test-only hooks a real server runs with when a test asks (environment variables read
once by the scheduler process's composition root): the hold gate, which freezes the loop
at a point the test chooses, and fault injection, an `Executor` wrapper that fails chosen
forwards. Nothing in the runtime's own code path knows they exist."""
