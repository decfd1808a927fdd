"""SimPy replay of execution graphs, hardware models, results and timeline export."""
