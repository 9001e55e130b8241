"""Data sets the models train on, read from files the user gives or shipped with the package."""
