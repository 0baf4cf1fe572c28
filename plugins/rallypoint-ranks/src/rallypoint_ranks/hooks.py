"""rallypoint hooks of the ranks plugin.

The plugin is installed and registered through the `rallypoint` entry point; the records it
registers are added here as their implementations land.
"""
