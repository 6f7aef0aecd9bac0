/* convert declarations (section of zero.h): not yet written. */
