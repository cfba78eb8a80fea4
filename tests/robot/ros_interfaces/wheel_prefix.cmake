# The ROS wheels' exported generator_py targets name the Python headers of the machine that built
# the wheels (/opt/python/...); point them at this interpreter's before rosidl links against them.
find_package(Python3 REQUIRED COMPONENTS Interpreter Development)
find_package(action_msgs REQUIRED)
foreach(dep action_msgs service_msgs builtin_interfaces unique_identifier_msgs)
  set(target ${dep}::${dep}__rosidl_generator_py)
  if(TARGET ${target})
    get_target_property(dirs ${target} INTERFACE_INCLUDE_DIRECTORIES)
    list(FILTER dirs EXCLUDE REGEX "^/opt/python/")
    list(APPEND dirs ${Python3_INCLUDE_DIRS})
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dirs}")
  endif()
endforeach()
