"""Features built on the API and the runtime: postprocessors, checkpoint operations, workflows."""
