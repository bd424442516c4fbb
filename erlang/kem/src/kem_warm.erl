%%% @doc Which kernels a port group served last, so a new spare or a
%%% restarted port compiles them before it says ready (docs/reliability.md,
%%% "Warm restarts").
%%%
%%% A shape is what a pipeline is compiled for: `{KernelId, EntryPoint,
%%% WithParams}'. Port owners report a shape the first time one of its calls
%%% succeeds (so unknown or failing kernels never enter the list); the
%%% group's list (in `kem_spare') keeps the `warm_kernels' most recently
%%% reported ones, newest first, and is sent to the port's `warm' method.
-module(kem_warm).
-export([shape/2, add/3, limit/0, note/3]).

-type shape() :: {binary(), binary(), boolean()}.
-export_type([shape/0]).

%% @doc The pipeline shape a kernel call needs, or `none' for other methods.
-spec shape(atom(), tuple()) -> shape() | none.
shape(execute_kernel, {Kernel, _Input, _Hint}) when is_binary(Kernel) ->
    {Kernel, <<"main">>, false};
shape(execute_kernel_with_params, {Kernel, _Input, _Params}) when is_binary(Kernel) ->
    {Kernel, <<"main">>, true};
shape(execute, {Kernel, _Input, Opts}) when is_binary(Kernel), is_map(Opts) ->
    case entry_point(maps:get(entry_point, Opts, <<"main">>)) of
        none -> none;
        Entry -> {Kernel, Entry, maps:is_key(params, Opts)}
    end;
shape(_Method, _Args) ->
    none.

entry_point(Name) when is_binary(Name) -> Name;
entry_point(Name) when is_atom(Name) -> atom_to_binary(Name, utf8);
entry_point(_) -> none.

%% @doc Put Shape first in List, keeping at most Limit shapes; `known' when
%% it was there already (the list is then unchanged: no refresh needed).
-spec add(shape(), [shape()], non_neg_integer()) -> {new | known, [shape()]}.
add(Shape, List, Limit) ->
    case lists:member(Shape, List) of
        true -> {known, List};
        false -> {new, lists:sublist([Shape | List], Limit)}
    end.

%% @doc How many shapes a group remembers (app env `warm_kernels'; 0 = off).
-spec limit() -> non_neg_integer().
limit() ->
    case application:get_env(kem, warm_kernels, 32) of
        N when is_integer(N), N >= 0 -> N;
        Other -> error({bad_config, {warm_kernels, Other}})
    end.

%% @doc A port owner's side: report Shape to the group once (Seen is the set
%% already reported; it is reset when it grows past 4x the limit, so a
%% caller cycling through many ids cannot grow it without bound).
-spec note(shape() | none, #{shape() => true}, non_neg_integer()) -> #{shape() => true}.
note(none, Seen, _Limit) -> Seen;
note(_Shape, Seen, 0) -> Seen;
note(Shape, Seen, Limit) ->
    case maps:is_key(Shape, Seen) of
        true -> Seen;
        false ->
            kem_spare:served(Shape),
            case map_size(Seen) >= 4 * Limit of
                true -> #{Shape => true};
                false -> Seen#{Shape => true}
            end
    end.
