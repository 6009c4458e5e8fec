package main

func renderMisses(p func(string, ...any), res *results, cfg *config) {}
