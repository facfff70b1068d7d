"""Each rank's device and its place on the data- x model-parallel mesh."""
