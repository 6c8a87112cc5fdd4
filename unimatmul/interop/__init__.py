"""Files of other tools that unimatmul reads and writes."""
