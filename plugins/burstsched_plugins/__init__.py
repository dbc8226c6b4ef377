"""The built-in burstsched plugins, registered through the ``burstsched.plugins`` entry-point group."""
