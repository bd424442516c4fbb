%%% @doc A single call's dispatch and constants from a HyperBEAM request
%%% (issue 25): `grid', `workgroups' and `constants' as `dev_kem''s
%%% `execute_kernel' / `execute_kernel_with_params' and `dev_kem_run''s
%%% `run' read them, turned into `kem:execute/3''s options.
%%%
%%% Each value in every form HyperBEAM delivers it (docs/hyperbeam.md):
%%% - `grid' / `workgroups': `[X, Y, Z]' (JSON, Lua, a typed list), the
%%%   header form `"X,Y,Z"', or `#{1 => X, 2 => Y, 3 => Z}' (a list after
%%%   HyperBEAM's normalisation); integers or decimal digits, each >= 1;
%%% - `constants': a nested message (multipart parts `constants/NAME', a
%%%   Lua table, a JSON object), name => number, the number typed
%%%   (`ao-types' integer or float, JSON) or as its decimal text; or the
%%%   header form `"SCALE=2.5, WG=16"' (an HTTP structured-field
%%%   dictionary).
%%% A bad value is `{error, Detail}' naming the key, for a 400; the port
%%% still checks what only the kernel can tell (an unknown override, a
%%% value outside its type).
-module(dev_kem_opts).

-export([dispatch/3, triple/3, bound/3, trim/1]).

%% 20 digits hold any 64-bit integer; longer text is not parsed
%% (binary_to_integer/1 of a megabyte of digits is seconds of CPU).
-define(MAX_DIGITS, 20).
%% A number's text: 64 bytes hold any double's shortest form (at most 24).
-define(MAX_NUMBER_TEXT, 64).
%% kem_args' bound (the port's MAX_CONSTANTS): checked here before any
%% value of a larger message is read.
-define(MAX_CONSTANTS, 64).
-define(MAX_NAME, 128).
-define(MAX_SHOWN, 64).

-type detail() :: binary().

%% @doc The options `Fields' (`grid', `workgroups', `constants', each
%% optional) make for kem:execute/3; `{error, Detail}' for a bad one or
%% for grid and workgroups together.
-spec dispatch(#{atom() => term()}, map(), map()) -> {ok, map()} | {error, detail()}.
dispatch(#{grid := _, workgroups := _}, _Opts, _Acc) ->
    {error, <<"give grid (invocations) or workgroups, not both">>};
dispatch(Fields, Opts, Acc) ->
    Steps = [{K, V} || K <- [grid, workgroups, constants], {ok, V} <- [maps:find(K, Fields)]],
    lists:foldl(fun({K, V}, {ok, Map}) -> add(K, V, Opts, Map);
                   (_, Error) -> Error
                end, {ok, Acc}, Steps).

add(constants, V, Opts, Map) ->
    case constants(V, Opts) of
        {ok, C} -> {ok, Map#{constants => C}};
        Error -> Error
    end;
add(Key, V, Opts, Map) ->
    case triple(Key, V, Opts) of
        {ok, T} -> {ok, Map#{Key => T}};
        Error -> Error
    end.

%% @doc `grid' or `workgroups' as `{X, Y, Z}'.
-spec triple(grid | workgroups, term(), map()) -> {ok, {pos_integer(), pos_integer(), pos_integer()}} | {error, detail()}.
triple(Key, [X, Y, Z], _Opts) ->
    case [dim(V) || V <- [X, Y, Z]] of
        [{ok, A}, {ok, B}, {ok, C}] -> {ok, {A, B, C}};
        _ -> bad_triple(Key)
    end;
triple(Key, Bin, Opts) when is_binary(Bin) ->
    triple(Key, binary:split(Bin, <<",">>, [global]), Opts);
triple(Key, Map, Opts) when is_map(Map), map_size(Map) =:= 3 ->
    triple(Key, [V || I <- [1, 2, 3], V <- [either(I, Map, Opts)], V =/= not_found], Opts);
triple(Key, _, _Opts) -> bad_triple(Key).

either(I, Map, Opts) ->
    case dev_kem:field(I, Map, Opts) of
        not_found -> dev_kem:field(integer_to_binary(I), Map, Opts);
        V -> V
    end.

dim(N) when is_integer(N), N >= 1, N =< 16#FFFFFFFF -> {ok, N};
dim(Bin) when is_binary(Bin) ->
    case integer_text(trim(Bin)) of
        {ok, N} -> dim(N);
        error -> error
    end;
dim(_) -> error.

bad_triple(Key) ->
    {error, <<(atom_to_binary(Key, utf8))/binary, " must be three integers 1..4294967295: [X, Y, Z] or \"X,Y,Z\"",
              (case Key of grid -> <<" (invocations)">>; workgroups -> <<>> end)/binary>>}.

%% @doc At most one workgroup, or one grid invocation, per 4-byte element
%% of the call's input and output together: what execute_kernel itself
%% dispatches at @workgroup_size(1), the bound dev_kem_run and chains
%% apply (a stranger's [65535, 65535, 64] on 4 bytes held a port for a
%% whole timeout, kem_isolation_tests). A grid of N invocations is at most
%% N workgroups whatever the kernel's workgroup size.
-spec bound(map(), non_neg_integer(), non_neg_integer()) -> ok | {error, detail()}.
bound(Opts, InBytes, OutBytes) ->
    Elements = max(1, (InBytes + OutBytes) div 4),
    case [{K, T} || K <- [grid, workgroups], {ok, T} <- [maps:find(K, Opts)]] of
        [{K, {X, Y, Z}}] when X * Y * Z > Elements ->
            {error, iolist_to_binary(io_lib:format(
                "~s ~bx~bx~b: at most ~b ~s, one per 4-byte element of the input and output",
                [K, X, Y, Z, Elements, case K of grid -> "invocations"; workgroups -> "workgroups" end]))};
        _ -> ok
    end.

%% Name => number.
constants(Map, _Opts) when is_map(Map), map_size(Map) > ?MAX_CONSTANTS ->
    {error, <<"constants: at most 64">>};
constants(Map, Opts) when is_map(Map) ->
    pairs([{K, dev_kem:field(K, Map, Opts)} || K <- maps:keys(Map)]);
constants(Bin, _Opts) when is_binary(Bin) ->
    Items = [trim(I) || I <- binary:split(Bin, <<",">>, [global])],
    case length(Items) > ?MAX_CONSTANTS of
        true -> {error, <<"constants: at most 64">>};
        false -> pairs([split_item(I) || I <- Items])
    end;
constants(_, _Opts) ->
    {error, <<"constants must be a message name => number (parts constants/NAME, a table, a JSON object) "
              "or the header form \"NAME=Number, ...\"">>}.

split_item(Item) ->
    case binary:split(Item, <<"=">>) of
        [K, V] -> {trim(K), trim(V)};
        _ -> {Item, missing}
    end.

pairs(Pairs) ->
    first_bad(Pairs, [{name(K), number(V)} || {K, V} <- Pairs], #{}).

first_bad([], [], Acc) -> {ok, Acc};
first_bad([{K, _} | _], [{error, _} | _], _Acc) ->
    {error, <<"constants: '", (shown(K))/binary, "' is not a WGSL name of at most 128 bytes">>};
first_bad([{K, _} | _], [{{ok, _}, error} | _], _Acc) ->
    {error, <<"constants: ", (shown(K))/binary, " must be a number (an integer, or a float such as 2.5; "
              "a bool override takes 0 or 1)">>};
first_bad([{K, _} | Rest], [{{ok, Name}, {ok, V}} | Checked], Acc) ->
    case maps:is_key(Name, Acc) of
        true -> {error, <<"constants: ", (shown(K))/binary, " is given twice">>};
        false -> first_bad(Rest, Checked, Acc#{Name => V})
    end.

name(K) when is_binary(K), byte_size(K) >= 1, byte_size(K) =< ?MAX_NAME ->
    case re:run(K, <<"^[A-Za-z_][A-Za-z0-9_]*$">>, [{capture, none}, dollar_endonly]) of
        match -> {ok, K};
        nomatch -> error
    end;
name(K) when is_atom(K), K =/= true, K =/= false -> name(atom_to_binary(K, utf8));
name(_) -> error.

%% A typed number, or its decimal text: an integer ("16", "-3") or a float
%% ("2.5", "-0.0", "1e-3", ".5"); nothing else (no inf or nan: WGSL has none).
number(V) when is_integer(V); is_float(V) -> {ok, V};
number(#{<<"body">> := Bin}) when is_binary(Bin) -> number(Bin);  % a part with headers of its own
number(Bin) when is_binary(Bin), byte_size(Bin) =< ?MAX_NUMBER_TEXT ->
    Text = trim(Bin),
    case integer_text(Text) of
        {ok, N} -> {ok, N};
        error -> float_text(Text)
    end;
number(_) -> error.

integer_text(<<"-", Digits/binary>>) ->
    case integer_text(Digits) of
        {ok, N} -> {ok, -N};
        error -> error
    end;
integer_text(Digits) when byte_size(Digits) >= 1, byte_size(Digits) =< ?MAX_DIGITS ->
    case lists:all(fun(C) -> C >= $0 andalso C =< $9 end, binary_to_list(Digits)) of
        true -> {ok, binary_to_integer(Digits)};
        false -> error
    end;
integer_text(_) -> error.

%% Erlang's binary_to_float/1 wants "D.DeX"; the text is matched first and
%% rebuilt in that form.
float_text(Text) ->
    case re:run(Text, <<"^([+-]?)([0-9]*)(?:\\.([0-9]*))?(?:[eE]([+-]?[0-9]{1,4}))?$">>,
                [{capture, all_but_first, binary}, dollar_endonly]) of
        {match, [Sign, Int, Frac | Exp]} when Int =/= <<>>; Frac =/= <<>> ->
            Zero = fun(<<>>) -> <<"0">>; (B) -> B end,
            E = case Exp of [X] when X =/= <<>> -> <<"e", X/binary>>; _ -> <<>> end,
            try {ok, binary_to_float(<<Sign/binary, (Zero(Int))/binary, ".", (Zero(Frac))/binary, E/binary>>)}
            catch error:badarg -> error  % past a double's range
            end;
        _ -> error
    end.

%% @doc ASCII blanks off both ends (string:trim/1 raises on bytes that
%% are not UTF-8); dev_kem_run reads its digits with it too.
-spec trim(binary()) -> binary().
trim(<<C, Rest/binary>>) when C =:= $\s; C =:= $\t -> trim(Rest);
trim(Bin) ->
    case Bin of
        <<Head:(byte_size(Bin) - 1)/binary, C>> when C =:= $\s; C =:= $\t -> trim(Head);
        _ -> Bin
    end.

shown(K) when is_binary(K) ->
    Printable = << <<(case C >= 16#20 andalso C =< 16#7E of true -> C; false -> $? end)>> || <<C>> <= K >>,
    case byte_size(Printable) > ?MAX_SHOWN of
        true -> binary:part(Printable, 0, ?MAX_SHOWN);
        false -> Printable
    end;
shown(K) when is_atom(K) -> shown(atom_to_binary(K, utf8));
shown(K) when is_integer(K) -> integer_to_binary(K);
shown(_) -> <<"?">>.
