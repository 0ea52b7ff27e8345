"""How rankscope's facts read to a person, one spelling each: rank lists, a rank's watch line."""
