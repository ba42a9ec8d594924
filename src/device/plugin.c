/* STUB: plugin loader */
