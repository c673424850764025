"""The project's own tools for its checkout (generated docs); not part of the installed product."""
