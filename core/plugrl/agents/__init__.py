"""Running agent loops: the session each sample talks to the engines and tools through, the
tool runtime, and the trajectories' way into a training batch (see :mod:`plugrl.parts.agent`
for the interfaces)."""
