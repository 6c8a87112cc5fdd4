"""The vocabulary: Problem, Platform, Backend and Candidate, arrays, dtypes, modes, plugins.

Nothing here measures, caches or prints; every other part of unimatmul builds on it,
and it imports none of them.
"""
