/* convert implementation (section of zero.h): not yet written. */
