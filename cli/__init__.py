"""Thin Typer commands over the library: parse options, call one function, render, map exit codes."""
